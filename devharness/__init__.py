"""The development harness that tests, benchmarks and scripts share.

Real services (``services``), vLLM on CPU (``vllm``), the whole testbed as processes
(``testbed``, on ``loraplane.process``), OpenAI calls (``openai_client``), a TCP proxy
that holds answers back (``tcp_pause``), and waiting for a condition (``waiting``).
Production packages never import it (``tests/test_layers.py``).
"""
