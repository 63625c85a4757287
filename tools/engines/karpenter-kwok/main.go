// Command karpenter-kwok runs Karpenter's kwok provider (sigs.k8s.io/karpenter/kwok) with its reserved offerings told
// apart, as the AWS provider tells capacity reservations apart.
//
// Karpenter's core keys each reserved offering by a label its cloud provider names (cloudprovider.ReservationIDLabel)
// and pins a reserved launch's NodeClaim to it. The AWS provider names karpenter.k8s.aws/capacity-reservation-id; the
// kwok provider names none, so a reserved launch would carry a requirement with an empty key. This main names AWS's
// label before the instance types are read, so an offering of the instance-types file that requires
// karpenter.sh/capacity-type=reserved and that label behaves as an EC2 capacity reservation does; the rest is the
// kwok provider, wired as its own main wires it.
package main

import (
	"sigs.k8s.io/controller-runtime/pkg/log"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

// reservationIDLabel is the AWS provider's label for a node's capacity reservation (karpenter-provider-aws
// pkg/apis/v1 LabelCapacityReservationID, set as cloudprovider.ReservationIDLabel in its init).
const reservationIDLabel = "karpenter.k8s.aws/capacity-reservation-id"

func main() {
	cloudprovider.ReservationIDLabel = reservationIDLabel
	ctx, op := operator.NewOperator()
	types, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "reading the instance types")
	}
	provider := kwok.NewCloudProvider(ctx, op.GetClient(), types)
	decorated := overlay.Decorate(provider, op.GetClient(), op.InstanceTypeStore)
	cluster := state.NewCluster(op.Clock, op.GetClient(), decorated)
	op.WithControllers(ctx, controllers.NewControllers(ctx, op.Manager, op.Clock, op.GetClient(), op.EventRecorder,
		decorated, provider, cluster, op.InstanceTypeStore)...).Start(ctx)
}
