"""Hydra configs for gambit-train (a package so they install with it and load via pkg://)."""
