"""Adapters that let other libraries' training loops use rlreplay's replay.

Each adapter lives in its own subpackage and imports its library only when imported
itself (``import rlreplay`` never does): :mod:`rlreplay.integrations.sb3` for
Stable-Baselines3 and CleanRL.
"""
