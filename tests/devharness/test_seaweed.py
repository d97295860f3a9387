"""The test S3 server keeps taking writes however many buckets a session makes."""

from __future__ import annotations

from devharness.services import SeaweedS3

# weed mini's automatic volume limit refused the 77th bucket on these machines;
# the suite makes one bucket per test that uses S3, so it ran out near the end.
BUCKETS = 120


def test_many_buckets_each_take_a_write(seaweed: SeaweedS3) -> None:
    client = seaweed.client()
    try:
        for i in range(BUCKETS):
            bucket = f"many-{i:03d}"
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="blob", Body=b"x" * 1024)
        body = client.get_object(Bucket=f"many-{BUCKETS - 1:03d}", Key="blob")["Body"]
        assert body.read() == b"x" * 1024
    finally:
        client.close()
