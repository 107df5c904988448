/* Memory copies: ordinary, or streaming (around the caches) for data that will
 * not be read again soon. */
#include <string.h>

#include "common/sim.h"

/* Large reductions and copies are bound by memory traffic; storing around the
 * cache removes the read-for-ownership of the destination, a third of it.
 * Streaming stores are weakly ordered: sim_store_fence() must run before the
 * data is published to another thread or process. */
static void copy_streaming(void *dst, const void *src, size_t bytes)
{
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    size_t lines = bytes / 64;
    sim_stream_lines(d, s, lines);
    memcpy(d + lines * 64, s + lines * 64, bytes % 64);
#else
    memcpy(dst, src, bytes);
#endif
}

void sim_copy(void *dst, const void *src, uint64_t bytes, bool streaming)
{
    if (bytes == 0 || dst == src)
        return;
    const char *s = src;
    char *d = dst;
    if (!streaming || (d < s + bytes && s < d + bytes)) { /* overlapping ranges need memmove */
        memmove(dst, src, (size_t)bytes);
        return;
    }
    copy_streaming(dst, src, (size_t)bytes);
}

void sim_store_fence(void)
{
#if defined(__x86_64__)
    _mm_sfence();
#else
    atomic_thread_fence(memory_order_seq_cst);
#endif
}
