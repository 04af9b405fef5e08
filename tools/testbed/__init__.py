"""Helpers of tools/train_testbed.py: the testbed model trainer (docs/testbed.md)."""
