"""`make bench` (``python -m hack.bench``): gpuhealth's performance on a fleet of fake GPU nodes; see
hack/bench/run.py for what one run measures, and docs/bench.md for the figures and how to read them."""
