"""Tests of the launchers: the local torchrun subprocess and the Kubernetes pods."""
