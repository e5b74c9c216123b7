package proxy

// PooledBuffersHeld returns how many pooled buffers (response copy
// buffers, upstream connections' head buffers) are taken and not given
// back, in the whole process.
func PooledBuffersHeld() int64 { return pooledHeld.Load() }
