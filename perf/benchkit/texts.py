"""The fixed texts every TTS benchmark speaks, so figures of different runs compare."""

TEXTS = [
    "The weather is lovely today. Let us take a walk in the park.",
    "Please call me back tomorrow morning at nine. I will be at my desk.",
    "Streaming speech arrives in small chunks. The first one comes quickly.",
    "A quick brown fox jumps over the lazy dog. Then it runs away.",
]
