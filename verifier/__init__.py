"""The Spark Structured Streaming verifier: lateness, early, duplicate and missing deliveries."""
