"""Bytes on disk and tables in memory, no I/O: the data file format (``datafile``, with its Arrow
dictionary columns in ``dictionaries``), the manifest and compaction record (``manifest``), the
table shapes rows take between the wire, the merge and the files (``tables``), Spark's UnsafeRow
bytes from typed rows (``unsaferow``) and the lookup-ready row images built from them (``rowimage``,
with their Bloom filter over key hashes in ``keyfilter``)."""
