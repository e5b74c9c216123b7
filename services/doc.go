// Package services runs gpuproxy's services: one OpenAI-compatible
// endpoint per model over replicas rented by spec. The Manager keeps each
// account's service definitions (create, update, delete), the Controller
// (one gpuproxy replica at a time, under a leader lock) keeps each
// service's replicas ready, replaces those that die and scales them
// within the spending limits, and the Router picks, on every gpuproxy
// replica, the ready replica with the fewest requests in flight for a
// request's model.
package services
