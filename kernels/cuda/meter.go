//go:build cgo

package cuda

import "github.com/tracegrpo/tracegrpo/kernels"

// meterPath names the metering device's driver and cuBLAS in DeviceInfo.
const meterPath = "(metering device: meter.h)"

// OpenMeter opens the backend on the metering device: an H200 (compute
// capability 9.0, 132 SMs, 143771 MiB) on which nothing runs. Allocations
// take no memory, launches and GEMMs return at once, downloads read zeros;
// the backend's own code (shapes, grids, kernel choices, scratch) runs
// unchanged, with its ledger on from the start. A training step on it
// records the launches a device would run (make gpu-model), on any machine
// with a C compiler, no GPU or emulator needed. opt's Options other than
// the libraries apply.
func OpenMeter(opt Options) (kernels.Backend, error) {
	opt.meter, opt.DriverLib, opt.BlasLib = true, "", ""
	b, err := OpenBackend(opt)
	if err != nil {
		return nil, err
	}
	b.led.on = true
	return b, nil
}
