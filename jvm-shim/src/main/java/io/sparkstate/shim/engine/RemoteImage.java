package io.sparkstate.shim.engine;

/**
 * A row image on remote checkpoint storage, as a lazy load names it (docs/protocol.md, "Row images on
 * remote storage"): its identity ({@code id}, the storage root and its path in the store, with the
 * manifest's size and checksum), the bytes a reader needs before its first lookup (its tail: block index,
 * filter header, trailer, as byte ranges), and how to read any other range of it.
 */
public final class RemoteImage {
  final String id;
  final String checksum;
  final long size;
  final long[] tailFrom;
  final long[] tailTo;
  final byte[][] tail;
  final RangeReader reader;
  /** Whether its fetches count as reads of checkpoint storage (the metrics): not the warm-up's own image's. */
  final boolean fromStorage;

  public RemoteImage(String id, String checksum, long size, long[] tailFrom, long[] tailTo, byte[][] tail,
      RangeReader reader) {
    this(id, checksum, size, tailFrom, tailTo, tail, reader, true);
  }

  RemoteImage(String id, String checksum, long size, long[] tailFrom, long[] tailTo, byte[][] tail,
      RangeReader reader, boolean fromStorage) {
    if (tailFrom.length != tailTo.length || tail.length != tailFrom.length) {
      throw new IllegalArgumentException("spark_state: a row image tail of " + tail.length + " pieces for "
          + tailFrom.length + " ranges");
    }
    for (int i = 0; i < tail.length; i++) {
      if (tailFrom[i] < 0 || tailTo[i] > size || tailTo[i] - tailFrom[i] != tail[i].length) {
        throw new IllegalArgumentException("spark_state: a row image tail piece of " + tail[i].length
            + " bytes for the range " + tailFrom[i] + ".." + tailTo[i] + " of " + size);
      }
    }
    this.id = id;
    this.checksum = checksum;
    this.size = size;
    this.tailFrom = tailFrom;
    this.tailTo = tailTo;
    this.tail = tail;
    this.reader = reader;
    this.fromStorage = fromStorage;
  }

  /** What the executor's cache keys the image's local copy by: the same file, size and content. */
  String key() {
    return id + "\n" + size + "\n" + checksum;
  }
}
