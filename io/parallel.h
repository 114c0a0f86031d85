// Running one piece of work on several threads, the calling thread among
// them, for copies, hashes and codecs that one core cannot keep up with.
//
// A thread the system refuses to start (pthread_create's EAGAIN: a process
// or cgroup thread limit, or no memory for a stack) is not an error: the
// work runs on the threads it got, the calling thread at least. Work is
// therefore written to share itself out (each thread takes the next item),
// never to expect a number of threads. A std::thread vector destroyed while
// an exception unwinds through it would abort the process instead ("terminate
// called without an active exception", seen in a loaded test run).
//
// Thread-safety: thread-safe; `work` and `fn` run concurrently with
// themselves.
#ifndef CKPT_IO_PARALLEL_H_
#define CKPT_IO_PARALLEL_H_

#include <cstddef>
#include <functional>

namespace ckpt::io {

// Runs `work` on the calling thread and on up to `helpers` more, and returns
// once every one returned. Returns how many threads ran it.
int RunOnThreads(int helpers, const std::function<void()>& work);

// Runs fn(0) ... fn(n - 1) on up to `threads` threads, the calling thread
// among them, each taking the next index in turn.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn);

}  // namespace ckpt::io

#endif  // CKPT_IO_PARALLEL_H_
