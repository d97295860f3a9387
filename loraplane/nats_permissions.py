"""Who may do what on NATS: the registry publishes events, agents only consume them.

Events are signed and verified (the bus is not trusted); these permissions are defence
in depth. Two NATS users, the same in every deployment this repository ships: the
embedded default (``loraplane.embedded_nats`` writes them into the server's config with
random passwords), ``compose.yaml`` and ``deploy/kubernetes`` (the config file
``deploy/nats/loraplane-auth.conf``, its passwords read from the NATS server's
environment). ``authorization_config`` renders them; the tests check that the shipped
files are exactly that rendering and run a real nats-server on it.

The agent user may read stream ``LORAPLANE``'s info, create, look up, delete and pull
from consumers of that stream and ack their messages, and receive replies in
``_INBOX.>``. It may publish nothing else: no event subject, and no request that
creates, changes, purges or deletes a stream. One agent user serves every agent, so it
may touch any consumer of the stream, not only ``agent-<id>`` (NATS subject tokens have
no prefix wildcards); see docs/security.md, "NATS permissions", for per-agent users.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from loraplane.events import STREAM_NAME, STREAM_SUBJECTS

REGISTRY_USER = "registry"
AGENT_USER = "agent"
# The environment variables the shipped NATS config reads the two passwords from.
PASSWORD_ENV = {REGISTRY_USER: "NATS_REGISTRY_PASSWORD", AGENT_USER: "NATS_AGENT_PASSWORD"}

_API = "$JS.API"


@dataclass(frozen=True)
class Permissions:
    """Subjects a NATS user may publish to and subscribe to (allow lists), and subjects
    it may never publish to, whatever the allow list says."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()


REGISTRY_PERMISSIONS = Permissions(
    # The events, and the JetStream API (it creates and updates the stream).
    publish=(STREAM_SUBJECTS, f"{_API}.>"),
    subscribe=("_INBOX.>", STREAM_SUBJECTS),
)

AGENT_PERMISSIONS = Permissions(
    publish=(
        f"{_API}.INFO",
        f"{_API}.STREAM.INFO.{STREAM_NAME}",
        # nats-py creates a durable consumer on the first subject, newer clients on the
        # second (CREATE.<stream>.<consumer>[.<filter>]).
        f"{_API}.CONSUMER.DURABLE.CREATE.{STREAM_NAME}.*",
        f"{_API}.CONSUMER.CREATE.{STREAM_NAME}.>",
        f"{_API}.CONSUMER.INFO.{STREAM_NAME}.*",
        f"{_API}.CONSUMER.DELETE.{STREAM_NAME}.*",
        f"{_API}.CONSUMER.MSG.NEXT.{STREAM_NAME}.*",
        f"$JS.ACK.{STREAM_NAME}.>",
    ),
    subscribe=("_INBOX.>",),
    deny_publish=(STREAM_SUBJECTS,),
)

USER_PERMISSIONS: Mapping[str, Permissions] = {REGISTRY_USER: REGISTRY_PERMISSIONS,
                                               AGENT_USER: AGENT_PERMISSIONS}


def _subjects(key: str, subjects: tuple[str, ...]) -> str:
    lines = "".join(f"            {json.dumps(s)}\n" for s in subjects)
    return f"          {key}: [\n{lines}          ]\n"


def _user_block(user: str, password: str, permissions: Permissions) -> str:
    deny = _subjects("deny", permissions.deny_publish) if permissions.deny_publish else ""
    return (f"    {{\n      user: {json.dumps(user)}\n      password: {password}\n"
            f"      permissions: {{\n"
            f"        publish: {{\n{_subjects('allow', permissions.publish)}{deny}        }}\n"
            f"        subscribe: {{\n{_subjects('allow', permissions.subscribe)}        }}\n"
            f"      }}\n    }}\n")


def authorization_config(passwords: Mapping[str, str] | None = None) -> str:
    """The ``authorization`` block of a nats-server config: the registry and agent users.

    ``passwords`` maps each user to its password, written quoted; None writes
    ``$NATS_REGISTRY_PASSWORD`` and ``$NATS_AGENT_PASSWORD``, which nats-server reads
    from its environment (the shipped deployments).
    """
    users = []
    for user, permissions in USER_PERMISSIONS.items():
        password = (f"${PASSWORD_ENV[user]}" if passwords is None
                    else json.dumps(passwords[user]))
        users.append(_user_block(user, password, permissions))
    return "authorization {\n  users: [\n" + "".join(users) + "  ]\n}\n"
