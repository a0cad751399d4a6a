"""Developer tooling, outside the installed package (run from the repository root): the side-by-side speed
benchmark (`python -m benchmarks`, cli.py) and the text front end's cost (`python -m benchmarks.text`). The load
tools against a running server are operator tools and ship with the package: wyoming_qwen3tts/tools/{load,soak}.py.

cli.py drives one worker subprocess per (size, engine); ours.py and peers.py are the workers;
roofline.py holds the byte counts and bandwidth floor; report.py the tables, chart and merging.
streams.py times our batched decoder at 1-16 streams; peers_batch.py (workers: peers_batch_workers.py) times the
batched peers, qwen3-tts-triton and faster-qwen3-tts-batch, at the same stream counts. qwentts_cpp.py is the worker
for qwentts.cpp (engines qcpp-bf16, qcpp-q8_0; batch 1 and concurrent streams), qwentts_cpp_prepare.py makes what it
runs on (the folder carried to the GPU box, its runtime there, the GGUF files) and qwentts_cpp_carry.sh the first.
"""
