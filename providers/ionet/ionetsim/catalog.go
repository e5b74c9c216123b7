package ionetsim

import "github.com/aiserve/gpuproxy"

// Hardware is one GPU model of the simulated catalog, as io.net's CaaS
// hardware list reports it, with its stock per location.
type Hardware struct {
	ID                  int    // hardware_id
	Name                string // hardware_name, e.g. "A100-SXM4-80GB"
	Brand               string // brand_name, e.g. "NVIDIA"
	MaxGPUsPerContainer int    // 1..8
	// PricePerGPUHour is the price of one GPU for one hour; the hardware
	// list reports it as price, the price endpoint multiplies it out.
	PricePerGPUHour gpuproxy.Micros
	Stock           []Stock
}

// Stock is the free capacity of one hardware at one location.
type Stock struct {
	LocationID int    // the id used in location_ids
	ISO2       string // e.g. "US"
	Name       string // e.g. "United States"
	FreeGPUs   int    // GPUs not deployed; a container takes gpus × replicas
}

// Locations of the default catalog.
var (
	locUS = Stock{LocationID: 1, ISO2: "US", Name: "United States"}
	locDE = Stock{LocationID: 3, ISO2: "DE", Name: "Germany"}
	locAU = Stock{LocationID: 5, ISO2: "AU", Name: "Australia"}
	locFI = Stock{LocationID: 7, ISO2: "FI", Name: "Finland"}
)

func at(l Stock, gpus int) Stock { l.FreeGPUs = gpus; return l }

// DefaultCatalog returns a realistic catalog: data-centre and consumer GPUs
// at several locations, one model sold out. Prices are USD per GPU-hour.
func DefaultCatalog() []Hardware {
	usd := func(cents int64) gpuproxy.Micros { return gpuproxy.Micros(cents * 10_000) }
	return []Hardware{
		{ID: 203, Name: "A100-SXM4-80GB", Brand: "NVIDIA", MaxGPUsPerContainer: 8, PricePerGPUHour: usd(149),
			Stock: []Stock{at(locUS, 16), at(locFI, 8)}},
		{ID: 206, Name: "H100-SXM5-80GB", Brand: "NVIDIA", MaxGPUsPerContainer: 8, PricePerGPUHour: usd(249),
			Stock: []Stock{at(locUS, 8), at(locDE, 8)}},
		{ID: 12, Name: "GeForce RTX 4090", Brand: "NVIDIA", MaxGPUsPerContainer: 8, PricePerGPUHour: usd(30),
			Stock: []Stock{at(locUS, 24), at(locAU, 8), at(locFI, 4)}},
		{ID: 208, Name: "L40S", Brand: "NVIDIA", MaxGPUsPerContainer: 8, PricePerGPUHour: usd(89),
			Stock: []Stock{at(locUS, 8), at(locDE, 4)}},
		{ID: 210, Name: "RTX A6000", Brand: "NVIDIA", MaxGPUsPerContainer: 4, PricePerGPUHour: usd(45),
			Stock: []Stock{at(locFI, 4)}},
		{ID: 215, Name: "A100-PCIE-40GB", Brand: "NVIDIA", MaxGPUsPerContainer: 4, PricePerGPUHour: usd(110),
			Stock: []Stock{at(locUS, 0)}},
	}
}

// clone deep-copies a catalog so the caller's slice is never mutated.
func clone(c []Hardware) []Hardware {
	out := make([]Hardware, len(c))
	for i, h := range c {
		h.Stock = append([]Stock(nil), h.Stock...)
		out[i] = h
	}
	return out
}
