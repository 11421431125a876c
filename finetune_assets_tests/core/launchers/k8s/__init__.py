"""Kubernetes launcher tests: manifests vs the official schema, and launches through a loopback
API test double (or a real cluster).
"""
