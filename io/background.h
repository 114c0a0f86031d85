// Background threads: a daemon's work that must not take the cores from the
// processes it serves (ckptd's persist, codec, replication and copies while a
// trainer copies its state into a slot) runs at a lower scheduling priority.
// The process sets how much lower once (SetBackgroundNice, ckptd's
// --background-nice); each such thread calls EnterBackground() as it
// starts, and the threads it starts inherit its priority.
//
// Thread-safety: thread-safe.
#ifndef CKPT_IO_BACKGROUND_H_
#define CKPT_IO_BACKGROUND_H_

namespace ckpt::io {

// The nice increment background threads take (0: none; at most 19).
void SetBackgroundNice(int increment);
int BackgroundNice();

// Lowers the calling thread's priority by BackgroundNice() (Linux: nice is
// per thread). A refusal is logged once and otherwise ignored.
void EnterBackground();

}  // namespace ckpt::io

#endif  // CKPT_IO_BACKGROUND_H_
