"""The control path: events and the watched folder become keys; reconcile decides, swap acts."""
