"""FL methods: what a site does in a round and what the server does with the uploads."""
