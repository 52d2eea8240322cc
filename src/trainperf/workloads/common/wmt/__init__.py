"""Shared machinery of the translation workloads (Transformer, GNMT): parallel text, subword
vocabularies, length-bucketed batches, beam search and BLEU."""
