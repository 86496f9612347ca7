package intent_test

import (
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Decode an intent as a worker receives it, then derive its key and
// fingerprint under the tool's spec.
func Example() {
	data := []byte(`{
		"tool": "charge_card",
		"args": {"customer": "cus_42", "amount_cents": 1999, "currency": "eur", "note": "thanks"},
		"session": "shop",
		"call_id": "call_7"
	}`)
	env, err := intent.Decode(data, intent.Limits{})
	if err != nil {
		fmt.Println(intent.Code(err), err)
		return
	}
	if err := env.CheckSubject("charge_card"); err != nil {
		fmt.Println(intent.Code(err), err)
		return
	}
	spec := intent.KeySpec{KeyArgs: []string{"customer", "amount_cents", "currency", "order"}}
	material, _ := intent.Material(env, spec, time.Time{})
	id, err := intent.Derive(env, spec, time.Time{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(env.Args))
	fmt.Println(string(material))
	fmt.Println(id.Key)
	fmt.Println(id.Fingerprint)
	// Output:
	// {"amount_cents":1999,"currency":"eur","customer":"cus_42","note":"thanks"}
	// {"args":{"amount_cents":1999,"currency":"eur","customer":"cus_42"},"session":"shop","tool":"charge_card","v":1}
	// charge_card.d89810356a8bbfa2736d5da48c08da511af765304739e51269745b1a6018f5ef
	// 4df8c141b4891e3af6834d3515003a8e70804ec464df0bb28ffe4874319f9322
}

// A rejected intent carries a clear message and maps to an answer's code.
func ExampleDecode_rejected() {
	_, err := intent.Decode([]byte(`{"tool":"charge_card","args":{"order":12345678901234567890}}`), intent.Limits{})
	fmt.Println(intent.Code(err))
	fmt.Println(err)
	// Output:
	// invalid_intent
	// intent: invalid: at byte 38: number 12345678901234567890 is beyond ±2^53 (9007199254740992) and cannot be kept exactly; send big identifiers as strings
}

func ExampleCanonicalize() {
	out, err := intent.Canonicalize([]byte(`{"b": [1.0, 1e-7, -0], "a": "\u00e9\n"}`))
	fmt.Println(string(out), err)
	// Output:
	// {"a":"é\n","b":[1,1e-7,0]} <nil>
}
