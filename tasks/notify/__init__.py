"""Telling people: the Slack client and its messages, the failure callback, the nightly
watchdog."""
