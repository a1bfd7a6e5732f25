"""real: executing plans on Ray (torch on CPU, vLLM + Megatron-core on GPUs).

Not implemented yet (tracked by its own issue); the package exists so the project layout is the
one the design fixes. Importing it does nothing.
"""
