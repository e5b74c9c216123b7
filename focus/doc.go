// Package focus exports the billing ledger as a FOCUS 1.2 cost-and-usage
// dataset (the FinOps Open Cost and Usage Specification), so that
// GPU-marketplace spend goes into the FinOps tools that already read the
// clouds' FOCUS exports. It depends on the domain and billing only.
//
// One ledger entry is one row. The mapping (Map) follows the 1.2 column
// rules; where the specification leaves a choice, this is ours:
//
//   - Money is exact: BilledCost is the entry's amount signed as finance
//     views show it (billing.Entry.Signed: charges and adjustments as
//     recorded, credits and refunds negative) in USD with six decimals, so
//     the column sums to the ledger's totals for the period to the
//     micro-dollar. EffectiveCost equals BilledCost (nothing is amortized:
//     an io.net prepaid rental has no later usage rows to spread over).
//     No negotiated prices exist, so ContractedCost equals ListCost.
//   - ChargeCategory: a metered charge, a proxy request charge and their
//     refunds are Usage (Usage-Based); an io.net prepaid rental and its
//     refund are Purchase (One-Time); a truth-up or manual adjustment is
//     Adjustment and a top-up is Credit (both One-Time).
//   - ChargeClass is "Correction" only as 1.2 defines it: an adjustment,
//     or a refund of a prepaid rental, of an instance whose charges began
//     in an earlier billing period (one already invoiced). A correction
//     within the current period is null, as the specification requires.
//   - The billing period is the calendar month (UTC) of the entry's time.
//   - Metered instance time is priced per instance-hour at the instance's
//     price (PricingUnit "Hours", ListUnitPrice the price per hour,
//     PricingQuantity the hours to nine decimals) and consumed in GPU-hours
//     (ConsumedUnit "GPU-Hours": hours × GPUs); ListCost is exactly
//     ListUnitPrice × PricingQuantity, as the rules demand, and so may
//     differ from BilledCost below a micro-dollar (the meter charges whole
//     milliseconds, rounded down). Rows priced per something we do not
//     record (a proxy request charge, a prepaid rental whose total is not
//     price × hours) are one "Units" at their amount.
//   - Date/times are UTC to the second ("2006-01-02T15:04:05Z"): period
//     starts round down and ends round up, so a period is never shorter
//     than what it covers.
//   - RegionId and RegionName are null: instances do not record the
//     offer's location.
//   - SubAccountId and SubAccountName are the API key the entry is
//     attributed to (its id when it has no name); null for none.
//   - Tags holds the user-defined label of the instance, and the name and
//     model of the service it is a replica of, under "label", "service"
//     and "model" (one scheme, so unprefixed); null when none applies.
//   - A null is an empty CSV field and a JSON null. Custom columns
//     (x_LedgerEntryId, x_LedgerType, x_LedgerBasis) follow the FOCUS
//     columns and tie each row to its ledger entry.
package focus
