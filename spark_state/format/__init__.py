"""Bytes on disk and tables in memory, no I/O: the data file format (``datafile``, with its Arrow
dictionary columns in ``dictionaries``), the manifest and compaction record (``manifest``), and the
table shapes rows take between the wire, the merge and the files (``tables``)."""
