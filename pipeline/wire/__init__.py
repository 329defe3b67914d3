"""Kafka's wire protocol: the front door that lets stock Kafka clients in (issue 51)."""
