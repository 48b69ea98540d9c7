"""File formats as bytes (no I/O): ``unsaferow`` (Spark's UnsafeRow bytes from typed Arrow rows) and
``rowimage`` (lookup-ready state files of UnsafeRow records, sorted by key group and hash)."""
