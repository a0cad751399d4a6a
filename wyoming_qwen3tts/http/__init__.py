"""The HTTP side of the server: an OpenAI-compatible speech API, a web page to try the voices, and metrics.

Off unless the `http` setting names where to listen; imported only then (aiohttp and PyAV load here).
"""
