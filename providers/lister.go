package providers

// FullLister is a provider whose List reports each instance as fully as
// Get does (status, endpoint, status message, tag), so a poller may read
// all of its instances with one listing per poll instead of one Get each
// (vast.ai rate-limits both; its list answers 25 instances a call).
// io.net's list items carry no endpoint or price: it is not one.
type FullLister interface {
	// ListsInFull marks the capability.
	ListsInFull()
}
