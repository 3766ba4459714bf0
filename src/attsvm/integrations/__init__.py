"""Bridges to other libraries' APIs. Each submodule imports its library lazily (see :mod:`attsvm._extras`).

* :mod:`~attsvm.integrations.kvpress` — attsvm's KV-cache scores as NVIDIA kvpress presses (``attsvm[kvpress]``).
"""
