// Package ionet is the io.net IO Cloud adapter: it implements
// providers.Provider on the enterprise container API (CaaS) under
// /enterprise/v1/io-cloud/caas, authenticated with the X-API-KEY header.
//
// io.net is prepaid: a deployment is bought for a whole number of hours up
// front (duration_hours) and charged in full when it is created. Offers are
// (hardware, location, GPUs per container) triples; their ids have the form
//
//	<hardware_id>:<location_id>:<gpus>
//
// for example "203:1:8" (hardware 203, location 1, 8 GPUs in one container).
// The hardware id is kept as the API gave it (an integer, or a string id such
// as "8H100.80S.176V"); the last two parts are integers.
//
// Every deployment is tagged with our instance id in resource_private_name,
// which io.net requires to be unique and reports back as the list item's
// name, so a reconciler can find a deployment whose create reply was lost.
// Deploy is never retried: a 5xx or transport failure is KindAmbiguous.
//
// The sub-package ionetsim is a faithful in-process simulator of the same
// wire format, used by the tests and by the sandbox mode of the binary.
package ionet
