"""The kdelay proxy: a Kafka broker facade for producers, plus the HTTP API."""
