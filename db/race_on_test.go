//go:build race

package db_test

// raceEnabled: the race detector slows SQLite's statement parsing several
// times over, so TestAdmissionDifferential compares fewer admissions in
// the -race run; .ci/run runs it again without -race at full size.
const raceEnabled = true
