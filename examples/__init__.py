"""Agents that learn through rlreplay, each one readable file (``rlreplay demo`` runs them).

Run one directly (``python examples/dqn_cartpole.py --help``) or through the demo
(``rlreplay demo --agent dqn``).
"""
