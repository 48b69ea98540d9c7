package io.sparkstate.shim.memory;

import java.util.concurrent.atomic.AtomicLong;

/**
 * What one holder holds of the {@link MemoryBudget}: the holder keeps it equal to its bytes with
 * {@link #set} (or {@link #add}) and closes it when it lets go. Thread-safe; closing twice is harmless.
 */
public final class Reservation implements AutoCloseable {
  private final MemoryBudget budget;
  private final String kind;
  private final AtomicLong kindTotal;
  private final AtomicLong bytes = new AtomicLong();
  private volatile boolean closed;

  Reservation(MemoryBudget budget, String kind, AtomicLong kindTotal) {
    this.budget = budget;
    this.kind = kind;
    this.kindTotal = kindTotal;
  }

  public String kind() {
    return kind;
  }

  public long bytes() {
    return bytes.get();
  }

  /** The holder holds {@code n} bytes now. */
  public void set(long n) {
    if (closed) {
      return;
    }
    long before = bytes.getAndSet(n);
    budget.add(kindTotal, n - before);
  }

  /** The holder holds {@code delta} more (or fewer) bytes. */
  public void add(long delta) {
    if (closed || delta == 0) {
      return;
    }
    bytes.addAndGet(delta);
    budget.add(kindTotal, delta);
  }

  public MemoryBudget budget() {
    return budget;
  }

  /** Releases what it holds; later updates are ignored. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    budget.add(kindTotal, -bytes.getAndSet(0));
  }
}
