"""The delay service: a replica that stores the buffer topic in RocksDB and, as master, forwards."""
