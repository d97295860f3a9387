"""loraplane as users deploy it, in containers: Postgres, NATS, S3 and the registry image.

``ContainerStack`` starts them with testcontainers on a network of their own, from the
images compose.yaml names or their local equivalents (``devharness.images``), and hands
the host the published addresses. The registry container reaches its dependencies by
service name, as in compose; presigned URLs name S3's published address, so a client on
the host (an agent outside the network) can download. Every container and the network
are removed by the context manager, even when a test fails.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from devharness import images

# testcontainers' reaper image cannot be pulled here; the context managers clean up.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

ADMIN_TOKEN = "lp_containers-admin-" + secrets.token_hex(8)
PG_USER, PG_PASSWORD, PG_DB = "loraplane", "containers-pw", "loraplane"
S3_KEY, S3_SECRET, BUCKET = "loraplane", "containers-secret", "loraplane-adapters"
_S3_CONFIG = (
    '{"identities":[{"name":"loraplane","credentials":[{"accessKey":"%s","secretKey":"%s"}],'
    '"actions":["Admin","Read","Write","List","Tagging"]}]}'
)
_WEED = ("printf '" + _S3_CONFIG + "' \"$S3_ACCESS_KEY\" \"$S3_SECRET_KEY\" > /tmp/s3.json; "
         "exec weed mini -dir=/data -s3.config=/tmp/s3.json -s3.port=8333 -volume.max=5000 "
         "-webdav=false -admin.ui=false -master.telemetry=false")


def image(key: str) -> str:
    """The tag to run for ``key``: LORAPLANE_IMAGE_<KEY> when set (a public image on a
    machine that can pull), else the local build."""
    tags = {i.key: i.tag for i in images.IMAGES}
    return os.environ.get(f"LORAPLANE_IMAGE_{key.upper()}", tags[key])


@dataclass
class ContainerStack:
    network: Network
    postgres: DockerContainer
    nats: DockerContainer
    s3: DockerContainer
    registry: DockerContainer | None = None

    def url(self, container: DockerContainer, port: int, scheme: str = "http") -> str:
        host = container.get_container_host_ip()
        return f"{scheme}://{host}:{container.get_exposed_port(port)}"

    @property
    def registry_url(self) -> str:
        assert self.registry is not None
        return self.url(self.registry, 8080)

    @property
    def nats_url(self) -> str:
        return self.url(self.nats, 4222, "nats")

    @property
    def s3_url(self) -> str:
        return self.url(self.s3, 8333)

    @property
    def database_dsn(self) -> str:
        host = self.postgres.get_container_host_ip()
        port = self.postgres.get_exposed_port(5432)
        return f"postgresql://{PG_USER}:{PG_PASSWORD}@{host}:{port}/{PG_DB}"

    def s3_client(self) -> object:
        return boto3.client(
            "s3", endpoint_url=self.s3_url, region_name="us-east-1",
            aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
            config=Config(connect_timeout=2, read_timeout=5,
                          retries={"mode": "standard", "total_max_attempts": 1}))

    def registry_env(self) -> dict[str, str]:
        return {
            "LORAPLANE_DATABASE_URL": f"postgresql://{PG_USER}:{PG_PASSWORD}@postgres:5432/{PG_DB}",
            "LORAPLANE_S3_ENDPOINT": "http://s3:8333",
            "LORAPLANE_S3_PUBLIC_ENDPOINT": self.s3_url,
            "LORAPLANE_S3_BUCKET": BUCKET,
            "LORAPLANE_S3_ACCESS_KEY": S3_KEY,
            "LORAPLANE_S3_SECRET_KEY": S3_SECRET,
            "LORAPLANE_NATS_URL": "nats://nats:4222",
            "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
            "LORAPLANE_PORT": "8080",
        }

    def loraplane_container(self, *command: str) -> DockerContainer:
        container = (DockerContainer(image("loraplane")).with_network(self.network)
                     .with_command(list(command)))
        for key, value in self.registry_env().items():
            container = container.with_env(key, value)
        return container

    def run_once(self, *command: str) -> tuple[int, str]:
        """Run the loraplane image with ``command`` to completion: (exit code, output)."""
        container = self.loraplane_container(*command).start()
        try:
            code = container.get_wrapped_container().wait(timeout=300)["StatusCode"]
            out, err = container.get_logs()
            return int(code), (out + err).decode(errors="replace")
        finally:
            container.stop()

    def start_registry(self) -> DockerContainer:
        self.registry = (self.loraplane_container("registry", "serve", "--host", "0.0.0.0")
                         .with_network_aliases("registry").with_exposed_ports(8080).start())
        return self.registry


def s3_ready(stack: ContainerStack) -> str | None:
    """None once S3 accepts a bucket (then the bucket exists), else why not."""
    client = stack.s3_client()
    try:
        client.create_bucket(Bucket=BUCKET)  # type: ignore[attr-defined]
    except ClientError as exc:
        if exc.response["Error"]["Code"] in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
            return None
        return str(exc)
    except BotoCoreError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@contextmanager
def container_stack() -> Iterator[ContainerStack]:
    """Postgres, NATS and S3 started (not yet waited for) on a fresh network."""
    with ExitStack() as stack:
        network = stack.enter_context(Network())

        def start(container: DockerContainer, alias: str) -> DockerContainer:
            container = container.with_network(network).with_network_aliases(alias).start()
            stack.callback(container.stop)
            return container

        postgres = start(DockerContainer(image("postgres"))
                         .with_env("POSTGRES_USER", PG_USER)
                         .with_env("POSTGRES_PASSWORD", PG_PASSWORD)
                         .with_env("POSTGRES_DB", PG_DB).with_exposed_ports(5432), "postgres")
        nats = start(DockerContainer(image("nats"))
                     .with_command(["nats-server", "--jetstream", "--store_dir", "/data",
                                    "--http_port", "8222"])
                     .with_exposed_ports(4222, 8222), "nats")
        s3 = start(DockerContainer(image("seaweedfs"))
                   .with_env("S3_ACCESS_KEY", S3_KEY).with_env("S3_SECRET_KEY", S3_SECRET)
                   .with_kwargs(entrypoint=["/bin/sh", "-ec"]).with_command([_WEED])
                   .with_exposed_ports(8333), "s3")
        result = ContainerStack(network, postgres, nats, s3)
        try:
            yield result
        finally:
            if result.registry is not None:
                result.registry.stop()
