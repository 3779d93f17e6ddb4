"""gradnode.protocol: pure codec, wire format, records and aggregation. No I/O, no clocks."""
