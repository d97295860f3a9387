# The loraplane image: the `loraplane` CLI, which runs the registry
# (`loraplane registry serve`) and migrates its database (`loraplane registry migrate`).
# compose.yaml builds it as loraplane:local. PYTHON_IMAGE swaps the base for an
# equivalent where the public one cannot be pulled (deploy/compose.local.yaml does).

ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# .dockerignore keeps the context to what the wheel needs (no tests, venvs or .git).
COPY . .
RUN python -m venv /opt/loraplane \
 && /opt/loraplane/bin/pip install . \
 && /opt/loraplane/bin/loraplane --version

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /var/lib/loraplane loraplane \
 && install -d -o loraplane -g loraplane -m 0750 /var/lib/loraplane \
 && install -d -o loraplane -g loraplane -m 0700 /run/loraplane
COPY --from=build /opt/loraplane /opt/loraplane
ENV PATH=/opt/loraplane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LORAPLANE_DATA_DIR=/var/lib/loraplane
USER loraplane
WORKDIR /var/lib/loraplane
VOLUME ["/var/lib/loraplane"]
EXPOSE 8080
ENTRYPOINT ["loraplane"]
CMD ["registry", "serve", "--host", "0.0.0.0"]
