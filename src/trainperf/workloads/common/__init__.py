"""Libraries several benchmarks share (COCO detection data and scoring, WMT text and decoding): no
benchmark lives here, so the registry never looks in this folder."""
