package alerts

import (
	"fmt"
	"strconv"

	"github.com/aiserve/gpuproxy"
)

// ServiceNotice is one event of a service (services.Options.OnEvent's
// hook): the controller scaled it, a rent was refused
// (service.scale_blocked), a replica became ready, was lost, replaced or
// drained, the service was created, updated or deleted.
type ServiceNotice struct {
	Service gpuproxy.Service
	Event   gpuproxy.ServiceEvent
}

func (n ServiceNotice) validate() error {
	switch {
	case n.Service.ID == "" || n.Service.AccountID == 0:
		return fmt.Errorf("service notice: no service id or account")
	case n.Event.Kind == "" || n.Event.At.IsZero():
		return fmt.Errorf("service notice of %s: no kind or time", n.Service.ID)
	}
	return nil
}

// dedupKey records each event once: by its stored id, or (not stored)
// by its kind and time.
func (n ServiceNotice) dedupKey() string {
	if n.Event.ID != 0 {
		return "service/" + strconv.FormatInt(n.Event.ID, 10)
	}
	return "service/" + n.Service.ID + "/" + n.Event.Kind + "/" + strconv.FormatInt(n.Event.At.UnixMicro(), 10)
}

// ServiceEvent is services.Options.OnEvent's hook: one webhook event per
// service event, of the service's account (none without alert
// settings). It never blocks the controller.
func (s *Service) ServiceEvent(svc gpuproxy.Service, e gpuproxy.ServiceEvent) {
	n := ServiceNotice{Service: svc, Event: e}
	if err := n.validate(); err != nil {
		s.log.Error("service alert event dropped", "account_id", svc.AccountID, "err", err)
		return
	}
	s.enqueue(hookEvent{accountID: svc.AccountID, instance: e.InstanceID, service: &n, at: e.At})
}

// ServiceAlert is the webhook event of a service event of account.
func ServiceAlert(accountID int64, account string, n ServiceNotice) (gpuproxy.AlertEvent, error) {
	if err := n.validate(); err != nil {
		return gpuproxy.AlertEvent{}, err
	}
	e := n.Event
	p := Payload{ID: newEventID(), Type: e.Kind, CreatedAt: e.At.UTC(), Account: account, InstanceID: e.InstanceID,
		Service: n.Service.Name, ServiceID: n.Service.ID, Message: e.Message}
	p.Text = fmt.Sprintf("gpuproxy: service %s (model %s) of account %s: %s", n.Service.Name, n.Service.Model, account, e.Message)
	return event(accountID, p, 0)
}
