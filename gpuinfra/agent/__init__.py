"""The node agent that runs on every GPU node (``python3 -m gpuinfra.agent.node`` or the same
file copied by the user data to ``/usr/local/lib/gpuinfra/gpuinfra_agent.py``)."""
