"""The decode loop on our fused kernels (kernels/, built by build.py and loaded by library.py), replayed as a graph.

options.py: what stays configurable; weights.py: the model's tensors as the kernels read them;
ops.py: typed wrappers over the C ABI; frame.py: one frame as a list of launches; prefill.py: the
prompt prefill as captured graphs; session.py and backend.py: the decode backend.
"""
