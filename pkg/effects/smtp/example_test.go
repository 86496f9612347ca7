package smtp_test

import (
	"fmt"

	"github.com/idemgate/idemgate/pkg/effects/smtp"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// An smtp tool sends every firing of an operation with the same Message-ID,
// derived from the key alone, so a mail system can drop a repeat.
func ExampleEffect_MessageID() {
	registry, err := toolsfile.Parse([]byte(`
tools:
  send_invoice:
    effect: smtp
    key_args: [to, invoice_id]
    smtp:
      addr: smtp.internal:587
      from: Billing <billing@example.com>
      starttls: required
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer registry.Close()
	tool, _ := registry.Lookup("send_invoice")
	mailer := tool.Effect.(*smtp.Effect)
	fmt.Println(tool.Kind, tool.MaxDuration)
	fmt.Println(mailer.MessageID("send_invoice", "send_invoice.0d9c4f"))
	// Output:
	// smtp 2m15s
	// <send_invoice.131cb6d4db38474581e0ec7053629b4b@example.com>
}
