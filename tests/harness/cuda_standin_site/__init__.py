"""Put on ``PYTHONPATH`` (not imported as a package) by a CUDA stand-in run: sitecustomize."""
