"""The GPU lab beside the product: the proof (vanilla vLLM against each tier's render, measured on
a GPU machine), its traces, host-stack samples and kernel benches, and the weightless stand-ins it
serves. Its own console script, `inference-lab`; the product (`inference-image`) imports none of it."""
