"""The consumer's side: incremental fetches through KIP-227 sessions (fetch.py; the consumers'
sessions and positions: sessions.py), consumer groups' offsets (fetch.py), a topic consumed by
Structured Streaming (stream.py), and exactly-once output (exactly_once.py)."""
