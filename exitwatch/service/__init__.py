"""The agent as a system service: its settings (config.py), its wiring (daemon.py), the
status socket, metrics, systemd notifications and log lines.

It may import everything below it: the agent, the kinds and the sources.
"""
