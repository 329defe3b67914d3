"""Round v2's data plane (DESIGN.md, "Round v2", 4): moving records. The control job decides every
offset and every fetch range; this package turns them into log rows, once per broker."""
