"""Notification sinks: Slack (Web API or incoming webhook), Alertmanager, console log."""
