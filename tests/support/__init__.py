"""Test support: infrastructure backends (local jars, testcontainers, external) and helpers."""
