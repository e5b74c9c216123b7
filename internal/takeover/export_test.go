package takeover

// BuffersHeld returns how many read and write buffers taken-over
// connections hold, in the whole process.
func BuffersHeld() int64 { return buffersHeld.Load() }
