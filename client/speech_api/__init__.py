"""OpenAI-compatible speech API (`POST /v1/audio/speech` and friends) in front of Triton.

Run it with `python -m client.speech_api --triton localhost:8001`. It talks to Triton only
(gRPC streaming through tritonclient's asyncio client); it never imports torch or loads a model.
"""
