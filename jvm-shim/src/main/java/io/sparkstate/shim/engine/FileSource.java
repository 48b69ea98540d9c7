package io.sparkstate.shim.engine;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Path;

/**
 * A row image on local disk, read with {@link RandomAccessFile} under a lock rather than a
 * {@code FileChannel}: a thread interrupted in a channel read closes the channel for every thread (Spark
 * interrupts the tasks of a stopped query), while a plain read ignores interrupts.
 */
final class FileSource implements BlockSource {
  private final Path path;
  private final RandomAccessFile file;

  FileSource(Path path) throws IOException {
    this.path = path;
    this.file = new RandomAccessFile(path.toFile(), "r");
  }

  @Override
  public long size() throws IOException {
    synchronized (file) {
      return file.length();
    }
  }

  @Override
  public byte[] read(long position, int length) throws IOException {
    byte[] dst = new byte[length];
    synchronized (file) {
      file.seek(position);
      file.readFully(dst);
    }
    return dst;
  }

  @Override
  public String name() {
    return path.toString();
  }

  @Override
  public Path path() {
    return path;
  }

  @Override
  public void close() throws IOException {
    synchronized (file) {
      file.close();
    }
  }
}
