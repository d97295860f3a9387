"""The development harness that tests, benchmarks and scripts share.

- services: real NATS, S3 (SeaweedFS) and Postgres (``services``), Prometheus
  (``prometheus``), the deployed containers (``containers``, ``images``);
- registries: the app in this process (``registry``, ``http_registry``), uploads to it
  (``uploads``);
- vLLM on CPU (``vllm``) and a stand-in for fleets (``vllm_standin``), the whole testbed
  as processes (``testbed``, ``processes``, on ``loraplane.process``);
- adapters written by hand (``adapters``), by PEFT (``peft_adapters``), decompression
  bombs (``bombs``);
- clients: OpenAI calls (``openai_client``), llm-d's endpoint picker (``llmd``,
  ``llmd_picker``), a TCP proxy that holds answers back (``tcp_pause``), and waiting for a
  condition (``waiting``).

Production packages never import it (``tests/test_layers.py``).
"""
